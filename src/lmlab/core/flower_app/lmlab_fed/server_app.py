"""The Flower ServerApp of lmlab's federated methods (`lmlab.core.federated.make_server_app`)."""

from lmlab.core.federated import make_server_app

app = make_server_app()
