"""Tests of KV events: the simulator's publisher and the router's decoder, index and subscriber."""
