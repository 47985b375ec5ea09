"""Training recipes of the fine-tuning tasks (`training.recipe.Recipe` subclasses)."""
