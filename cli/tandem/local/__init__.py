"""The local runtime behind `tandem up`: one InferenceService as processes on this machine."""
