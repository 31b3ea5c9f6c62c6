"""The project's own models: each folder a checkpoint, each package the code that made it."""
