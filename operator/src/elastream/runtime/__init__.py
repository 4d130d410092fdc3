"""elastream.runtime."""
