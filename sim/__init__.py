"""The plant simulator: the controller (santhrottle.controller) against a modelled array."""
