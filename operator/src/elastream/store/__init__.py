"""elastream.store."""
