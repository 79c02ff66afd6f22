"""A Python client for the Trainyard coordinator, over the same CURVE wire as jobctl.

    from trainyard import Client
    client = Client()  # $TRAINYARD_COORDINATOR and $TRAINYARD_KEYS, as jobctl reads them
    job = client.submit("job.yaml", overrides={"train.epochs": 1})
    final = client.wait(job)
    for row in client.logs(job):
        print(row["epoch"], row["eval_acc"])
"""
from trainyard.client import Client, ClientError, JobFileError, Refused, Unreachable

__all__ = ["Client", "ClientError", "JobFileError", "Refused", "Unreachable"]
