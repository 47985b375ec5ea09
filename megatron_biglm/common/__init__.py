"""Floor 0: what every other package may use and nothing of ours imports back
(config_fields: the one coercion and unknown-key mechanism of config dataclasses)."""
