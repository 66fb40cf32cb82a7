"""Selection methods (choosing, routing and coordinating among a pool of models)."""
