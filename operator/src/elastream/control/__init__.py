"""elastream.control."""
