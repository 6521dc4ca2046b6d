"""Repositories: one module per table, the only code that knows table layouts and OData filters."""
