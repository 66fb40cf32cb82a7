"""The Flower ClientApp of lmlab's federated methods (`lmlab.core.federated.engine.make_client_app`)."""

from lmlab.core.federated.engine import make_client_app

app = make_client_app()
