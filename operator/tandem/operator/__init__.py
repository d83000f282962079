"""The kopf operator for InferenceService resources."""
