"""Front ends: the command line, the pytest plugin, widgets and IPython magics."""
