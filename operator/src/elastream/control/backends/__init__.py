"""elastream.control.backends."""
