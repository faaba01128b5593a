"""santhrottle.appliance."""
