"""The simulator's pure core: no HTTP, no Redis, no wall clock; time comes from an injected `Clock`."""
