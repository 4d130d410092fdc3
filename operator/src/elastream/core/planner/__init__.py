"""elastream.core.planner."""
