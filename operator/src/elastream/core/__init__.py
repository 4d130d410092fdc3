"""elastream.core."""
