"""System checks (placeholder until conf validation lands)."""
