"""The driver service: any driver in its own process, reached over a Unix socket.

Run a service with ``nnapi serve --driver DRIVER --socket PATH`` or ``python -m
nnapi.drivers.service --driver DRIVER --socket PATH`` (DRIVER: ``pkg.module:factory`` or a
shipped driver's short name: reference, sample, faulty, ort, fibonacci). Clients name services in
``NNAPI_REMOTE_DEVICES=PATH[,PATH...]`` (or one path per line in the file named by
``NNAPI_REMOTE_DEVICES_FILE``); their devices then appear in ``nnapi.get_devices()`` as
``DEVICE@SERVICE``, SERVICE being the socket file's stem.

``wire`` is the message format (msgpack, versioned, strictly decoded), ``server`` the
service, ``client`` the HAL proxies the runtime uses. Requires the ``service`` extra
(``pip install 'nnapi[service]'``, i.e. msgpack).
"""
