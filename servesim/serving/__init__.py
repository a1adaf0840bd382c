"""Serving: engine settings and the discrete-event serving simulator."""
