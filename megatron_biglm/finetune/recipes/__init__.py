"""Fine-tuning recipes (training/recipe.py's `Recipe`), one per task kind, each constructed as
`RecipeClass(task, tokenizer, options)`. Here: `seq2seq` (`seq2seq.Seq2SeqRecipe`)."""
