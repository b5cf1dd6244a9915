"""The worker's private parts, behind `platoon.worker.Worker`: its control client
(`client`), its side of the minibatch channel (`minibatches`), the exchange that syncs its
parameters with the centre (`exchange`) and its side of all_reduce (`collectives`). Only a
worker process loads them."""
