"""The reference runner: generate with a real model, stream every sequence through the core."""
