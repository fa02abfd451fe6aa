"""dashboard package (see ARCHITECTURE)."""
