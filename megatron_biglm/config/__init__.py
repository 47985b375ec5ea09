"""The run configuration's typed sections (floor 2: below training, export and evaluation,
which all read them)."""
