"""Fine-tuning recipes (training/recipe.py's seam), one module per kind of run."""
