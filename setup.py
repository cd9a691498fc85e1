from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "replicad.native._cityhash102",
            sources=["replicad/native/cityhash102.c"],
            depends=["replicad/native/cityhash102_core.h"],
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
            "replicad.native._arraytext",
            sources=["replicad/native/arraytext.c"],
            depends=["replicad/native/string_offsets.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._tsvsplit",
            sources=["replicad/native/tsvsplit.c"],
            depends=["replicad/native/text_numbers.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._csvsplit",
            sources=["replicad/native/csvsplit.c"],
            depends=["replicad/native/column_buffers.h", "replicad/native/text_numbers.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._jsonsplit",
            sources=["replicad/native/jsonsplit.c"],
            depends=["replicad/native/column_buffers.h", "replicad/native/text_numbers.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._textints",
            sources=["replicad/native/textints.c"],
            depends=["replicad/native/string_offsets.h", "replicad/native/text_numbers.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._kmerge",
            sources=["replicad/native/kmerge.c", "replicad/native/kgather.c"],
            depends=["replicad/native/kruns.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._siphash",
            sources=["replicad/native/siphash.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._wholepart",
            sources=["replicad/native/wholepart.c"],
            depends=["replicad/native/cityhash102_core.h", "replicad/native/system_codecs.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._partread",
            sources=["replicad/native/partread.c"],
            depends=["replicad/native/cityhash102_core.h", "replicad/native/system_codecs.h"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._checksums",
            sources=["replicad/native/checksums.c"],
            extra_compile_args=["-O3"],
        ),
        Extension(
            "replicad.native._files",
            sources=["replicad/native/files.c"],
            extra_compile_args=["-O3"],
        ),
    ]
)
