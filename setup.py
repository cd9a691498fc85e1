from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "replicad.native._cityhash102",
            sources=["replicad/native/cityhash102.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._strings",
            sources=["replicad/native/strings.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._bitcodecs",
            sources=["replicad/native/bitcodecs.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._siphash",
            sources=["replicad/native/siphash.c"],
            extra_compile_args=["-O3"],
        ),
    ]
)
