"""Programs that run inside the processes diagtools watches: standard library only."""
