"""The domain: the config schema, the config model, the variant registry and its dialects, argv,
the probe's capabilities and the user-facing errors. Pure: nothing here runs a program."""
