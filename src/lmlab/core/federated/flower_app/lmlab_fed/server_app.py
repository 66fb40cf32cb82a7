"""The Flower ServerApp of lmlab's federated methods (`lmlab.core.federated.engine.make_server_app`)."""

from lmlab.core.federated.engine import make_server_app

app = make_server_app()
