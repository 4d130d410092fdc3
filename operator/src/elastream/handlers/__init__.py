"""elastream.handlers."""
