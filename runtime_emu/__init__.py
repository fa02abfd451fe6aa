"""runtime_emu package (see ARCHITECTURE)."""
