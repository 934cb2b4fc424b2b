"""Records, the SQLite store, environment fingerprints and exports."""
