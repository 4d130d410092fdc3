"""elastream.analysis."""
