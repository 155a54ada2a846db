"""One file per architecture, named by the `model_type` of the config.json it reads
(`orion.models.registry` finds them by that name; docs/adding-a-model.md is the recipe)."""
