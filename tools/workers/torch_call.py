"""A kernel call as data: what an adapter of torch_backends.py calls, which it both executes and
renders as Python source (tools/workers/torch_export.py writes that source into the standalone
repro.py of `attest repro --export`). One description, two uses, so that the exported script
makes exactly the call the adapter made: the same function, the same positional and keyword
arguments, the same views of the inputs, the same context manager.

Values in a description:
  Ref(name)             a tensor the caller supplies by name (q, k, v in attest's layout)
  Data(name, tensor)    a tensor the adapter built (an attn_mask), carried by value
  Attr(module, name)    a module attribute (torch.nn.functional.scaled_dot_product_attention,
                        torch.nn.attention.SDPBackend.MATH); `obj` is what runs here
  Method(base, name, *args)  base.name(*args) (q.transpose(1, 2))
  Invoke(fn, *args, **kwargs)  fn(*args, **kwargs) (causal_lower_right(5, 7))
  Index(base, key)      base[key] (out[0], q[None])
  Getattr(base, name)   base.name (q.device, aux.lse)
  Global(name, value)   a value the script defines once under `name` (PROBLEM: the case's
                        problem object)
  Func(fn, deps)        a function of attest's adapters that the call needs (FlexAttention's
                        mask and score functions, the bias the adapter builds, lse's layout):
                        run as itself here, written into the script as its own source
                        (inspect.getsource) with the functions it calls, so that the script
                        runs the code the adapter ran, not a copy written by hand
  lists, tuples, dicts and Python literals (None, bool, int, float, str) as themselves
"""

import importlib
import inspect
import math
import textwrap


class Ref:
    def __init__(self, name):
        self.name = name


class Data:
    def __init__(self, name, tensor):
        self.name = name
        self.tensor = tensor


class Attr:
    def __init__(self, module, name, obj=None):
        self.module = module
        self.name = name
        self._obj = obj

    @property
    def path(self):
        return f"{self.module}.{self.name}"

    @property
    def obj(self):
        if self._obj is None:
            obj = importlib.import_module(self.module)
            for part in self.name.split("."):
                obj = getattr(obj, part)
            self._obj = obj
        return self._obj


class Method:
    def __init__(self, base, name, *args):
        self.base = base
        self.name = name
        self.args = args


class Invoke:
    def __init__(self, fn, *args, **kwargs):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


class Index:
    def __init__(self, base, key):
        self.base = base
        self.key = key


class Getattr:
    def __init__(self, base, name):
        self.base = base
        self.name = name


class Global:
    def __init__(self, name, value):
        self.name = name
        self.value = value


class Func:
    """A module-level function `fn` and the module-level functions it calls (`deps`), and the
    modules its source names (`modules`)."""

    def __init__(self, fn, deps=(), modules=()):
        self.fn = fn
        self.deps = tuple(deps)
        self.modules = tuple(modules)

    def definitions(self):
        """{name: source} of fn, its deps and every module-level function of fn's module
        that they call (found by the names their code reads), callees first."""
        out = {}

        def add(f):
            if f.__name__ in out:
                return
            out[f.__name__] = None  # placeholder: recursion stops here
            for callee in _callees(f):
                add(callee)
            del out[f.__name__]
            out[f.__name__] = textwrap.dedent(inspect.getsource(f)).rstrip() + "\n"
        for f in self.deps + (self.fn,):
            add(f)
        return out


def _callees(f):
    """The module-level functions of f's module that f's code (nested functions included)
    names."""
    names, codes = set(), [f.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    found = []
    for n in sorted(names):
        g = f.__globals__.get(n)
        if inspect.isfunction(g) and g.__module__ == f.__module__ and g is not f:
            found.append(g)
    return found


class Sources(set):
    """What rendered source needs: the modules to import (the set's elements) and the
    functions to define (`defs`, name to source, in first-use order)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.defs = {}
        self.globals = {}


def evaluate(value, env):
    """The value a description stands for; `env` maps Ref names to tensors."""
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, Data):
        return value.tensor
    if isinstance(value, Attr):
        return value.obj
    if isinstance(value, Method):
        return getattr(evaluate(value.base, env), value.name)(
            *(evaluate(a, env) for a in value.args))
    if isinstance(value, Invoke):
        return evaluate(value.fn, env)(*(evaluate(a, env) for a in value.args),
                                       **{k: evaluate(v, env) for k, v in value.kwargs.items()})
    if isinstance(value, Index):
        return evaluate(value.base, env)[evaluate(value.key, env)]
    if isinstance(value, Getattr):
        return getattr(evaluate(value.base, env), value.name)
    if isinstance(value, Global):
        return value.value
    if isinstance(value, Func):
        return value.fn
    if isinstance(value, list):
        return [evaluate(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(evaluate(v, env) for v in value)
    if isinstance(value, dict):
        return {k: evaluate(v, env) for k, v in value.items()}
    return value


def render(value, imports):
    """Python source for `value`; the modules it needs are added to `imports`."""
    if isinstance(value, (Ref, Data)):
        return value.name
    if isinstance(value, Attr):
        if value.module == "builtins":
            return value.name
        imports.add(value.module)
        return value.path
    if isinstance(value, Method):
        return f"{render(value.base, imports)}.{value.name}({_args(value.args, {}, imports)})"
    if isinstance(value, Invoke):
        return f"{render(value.fn, imports)}({_args(value.args, value.kwargs, imports)})"
    if isinstance(value, Index):
        key = value.key
        return f"{render(value.base, imports)}[{render(key, imports)}]"
    if isinstance(value, Getattr):
        return f"{render(value.base, imports)}.{value.name}"
    if isinstance(value, Global):
        if hasattr(imports, "globals"):
            imports.globals[value.name] = value.value
        return value.name
    if isinstance(value, Func):
        imports.update(value.modules)
        if hasattr(imports, "defs"):
            for name, src in value.definitions().items():
                imports.defs.setdefault(name, src)
        return value.fn.__name__
    if isinstance(value, list):
        return "[" + ", ".join(render(v, imports) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {render(v, imports)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        inner = ", ".join(render(v, imports) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else '-float("inf")'
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    raise TypeError(f"cannot render a {type(value).__name__} as source")


def _args(args, kwargs, imports):
    words = [render(a, imports) for a in args]
    words += [f"{k}={render(v, imports)}" for k, v in kwargs.items()]
    return ", ".join(words)


def data_of(value, out=None):
    """The Data tensors a description carries, in order, each once."""
    out = [] if out is None else out
    if isinstance(value, Data):
        if all(d is not value for d in out):
            out.append(value)
    elif isinstance(value, Method):
        data_of(value.base, out)
        for a in value.args:
            data_of(a, out)
    elif isinstance(value, Invoke):
        data_of(value.fn, out)
        for a in list(value.args) + list(value.kwargs.values()):
            data_of(a, out)
    elif isinstance(value, (Index, Getattr)):
        data_of(value.base, out)
    elif isinstance(value, (list, tuple)):
        for a in value:
            data_of(a, out)
    elif isinstance(value, dict):
        for a in value.values():
            data_of(a, out)
    return out


class Call:
    """One call of the kernel's entry point: `target` (an Attr: the function the script's
    --fn replaces) with `args` and `kwargs`, inside `context` (a context manager, or None);
    its result, the first element where it is a tuple or list and `first_of_tuple` holds, is
    bound to `out` and `output` (a description over Ref("out")) gives the output in attest's
    layout, `lse` (likewise, or None) the lse. Before the call, `setup` binds names in order
    ([(name, description)], each over the Refs and the names bound before it: FlexAttention's
    block mask); `wrap` (a description over Ref("fn"), or None) is what the caller calls in
    place of the function itself (torch.compile(fn, ...)), and `prelude` the statements run
    once before any call (descriptions; torch._dynamo's limits)."""

    def __init__(self, target, args, kwargs, context=None, output=None, first_of_tuple=False,
                 lse=None, setup=(), wrap=None, prelude=()):
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.context = context
        self.output = output if output is not None else Ref("out")
        self.first_of_tuple = first_of_tuple
        self.lse = lse
        self.setup = list(setup)
        self.wrap = wrap
        self.prelude = list(prelude)

    def wrapped(self, fn=None):
        """The function called: `fn` (default the target) through `wrap`."""
        fn = self.target.obj if fn is None else fn
        return fn if self.wrap is None else evaluate(self.wrap, {"fn": fn})

    def run_both(self, env, fn=None, wrapped=False):
        """(output, lse or None) of the call with the tensors `env` names, `fn` in place of
        the target (already through `wrap` where `wrapped`)."""
        fn = fn if wrapped else self.wrapped(fn)
        env = dict(env)
        for name, value in self.setup:
            env[name] = evaluate(value, env)
        args = [evaluate(a, env) for a in self.args]
        kwargs = {k: evaluate(v, env) for k, v in self.kwargs.items()}
        if self.context is not None:
            with evaluate(self.context, env):
                out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        if self.first_of_tuple and isinstance(out, (tuple, list)):
            out = out[0]
        env["out"] = out
        return (evaluate(self.output, env),
                evaluate(self.lse, env) if self.lse is not None else None)

    def run(self, env, fn=None, wrapped=False):
        """The output of the call (run_both's first)."""
        return self.run_both(env, fn, wrapped)[0]

    def data(self):
        return data_of([self.context, list(self.args), list(self.kwargs.values()),
                        [v for _, v in self.setup]])

    def source(self, name, imports, indent="    "):
        """A Python function `name(fn, q, k, v, <the Data tensors by name>)` making this call
        (fn already through `wrap`: prelude_source and wrap_source say how); its lines. It
        returns the output, or (output, lse) where the call has an lse."""
        call = f"fn({_args(self.args, self.kwargs, imports)})"
        if len(call) > 80:  # one argument a line
            words = [render(a, imports) for a in self.args]
            words += [f"{k}={render(v, imports)}" for k, v in self.kwargs.items()]
            pad = indent * (3 if self.context is not None else 2)
            call = "fn(\n" + "".join(f"{pad}{w},\n" for w in words) + pad[:-4] + ")"
        params = ", ".join(["fn", "q", "k", "v"] + [d.name for d in self.data()])
        lines = [f"def {name}({params}):"]
        body = [f"{n} = {render(v, imports)}" for n, v in self.setup]
        if self.context is not None:
            body.append(f"with {render(self.context, imports)}:")
            body.append(f"{indent}out = {call}")
        else:
            body.append(f"out = {call}")
        if self.first_of_tuple:
            body.append("if isinstance(out, (tuple, list)):  # a function that also returns "
                        "its weights")
            body.append(f"{indent}out = out[0]")
        ret = render(self.output, imports)
        if self.lse is not None:
            ret += ", " + render(self.lse, imports)
        body.append(f"return {ret}")
        lines += [indent + b for b in body]
        return lines

    def wrap_source(self, imports):
        """Source of the expression that wraps `fn` (None: called as it is)."""
        return None if self.wrap is None else render(self.wrap, imports)

    def prelude_source(self, imports):
        return [render(x, imports) for x in self.prelude]
