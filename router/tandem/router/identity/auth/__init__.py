"""API keys at the gateway: the key table (pure) and the file it is loaded from (reloaded on change)."""
