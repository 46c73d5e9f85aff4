"""subpackage_tree: places a source directory inside the m4moe package.

setup.py installs the repository's `data/`, `eval/` and `configs/` as
`m4moe.data`, `m4moe.eval` and `m4moe.configs` (package_dir). Bazel has no
such mapping, so this rule copies a directory's files into a tree artifact
`m4moe/<dir_name>/` that sits next to the m4moe sources in runfiles, where
`import m4moe.data` and `importlib.resources.files("m4moe.configs")` find it.
"""

def _subpackage_tree_impl(ctx):
    out = ctx.actions.declare_directory(ctx.attr.dir_name)
    prefix = ctx.attr.strip_prefix
    commands = ["mkdir -p '%s'" % out.path]
    for src in ctx.files.srcs:
        if not src.short_path.startswith(prefix):
            fail("%s is not under %s" % (src.short_path, prefix))
        dest = "%s/%s" % (out.path, src.short_path[len(prefix):])
        commands.append("mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'" %
                        (dest, src.path, dest))
    ctx.actions.run_shell(
        inputs = ctx.files.srcs,
        outputs = [out],
        command = " && ".join(commands),
        progress_message = "Copying %s into m4moe/%s" % (prefix, ctx.attr.dir_name),
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

subpackage_tree = rule(
    implementation = _subpackage_tree_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = True, mandatory = True),
        "strip_prefix": attr.string(mandatory = True),
        "dir_name": attr.string(mandatory = True),
    },
    doc = "Copies srcs (paths minus strip_prefix) into the directory dir_name.",
)
