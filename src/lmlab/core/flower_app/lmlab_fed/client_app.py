"""The Flower ClientApp of lmlab's federated methods (`lmlab.core.federated.make_client_app`)."""

from lmlab.core.federated import make_client_app

app = make_client_app()
