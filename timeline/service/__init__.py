"""The API's operations: validation, authorization, storage and queueing behind each route."""
