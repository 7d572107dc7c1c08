"""Stand-in package (tests only)."""
