"""analyzers package (see ARCHITECTURE)."""
