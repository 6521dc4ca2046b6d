"""Flow control: the adaptive limit on storage requests in flight, the guard on each call."""
