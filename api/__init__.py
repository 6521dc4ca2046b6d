"""The aiohttp REST API: a thin HTTP shell over ``timeline.service``."""
