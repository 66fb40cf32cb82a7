"""The federated engine (client / server logic run in-process or on Flower) and its Flower app bundle."""
