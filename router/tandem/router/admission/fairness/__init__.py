"""Fair queuing between tenants."""
