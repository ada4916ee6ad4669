"""The command line and the dashboard: the only place typer and rich are imported."""
