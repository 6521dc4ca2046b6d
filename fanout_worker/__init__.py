"""The fan-out daemon: a thin queue-consuming shell over ``timeline.delivery.processor``."""
