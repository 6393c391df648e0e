"""Position-encoding building blocks, one scheme per file."""
