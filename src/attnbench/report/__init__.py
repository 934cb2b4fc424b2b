"""Tables, plots and reports built from records."""
