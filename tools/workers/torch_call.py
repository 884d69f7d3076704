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
  lists, tuples and Python literals (None, bool, int, float, str) as themselves
"""

import importlib
import math


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
    if isinstance(value, list):
        return [evaluate(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(evaluate(v, env) for v in value)
    return value


def render(value, imports):
    """Python source for `value`; the modules it needs are added to `imports`."""
    if isinstance(value, (Ref, Data)):
        return value.name
    if isinstance(value, Attr):
        imports.add(value.module)
        return value.path
    if isinstance(value, Method):
        return f"{render(value.base, imports)}.{value.name}({_args(value.args, {}, imports)})"
    if isinstance(value, Invoke):
        return f"{render(value.fn, imports)}({_args(value.args, value.kwargs, imports)})"
    if isinstance(value, list):
        return "[" + ", ".join(render(v, imports) for v in value) + "]"
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
    elif isinstance(value, (list, tuple)):
        for a in value:
            data_of(a, out)
    return out


class Call:
    """One call of the kernel's entry point: `target` (an Attr: the function the script's
    --fn replaces) with `args` and `kwargs`, inside `context` (a context manager, or None);
    its result, the first element where it is a tuple or list and `first_of_tuple` holds, is
    bound to `out` and `output` (a description over Ref("out")) gives the output in attest's
    layout."""

    def __init__(self, target, args, kwargs, context=None, output=None, first_of_tuple=False):
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.context = context
        self.output = output if output is not None else Ref("out")
        self.first_of_tuple = first_of_tuple

    def run(self, env, fn=None):
        """Makes the call with the tensors `env` names (and `fn` in place of the target)."""
        fn = self.target.obj if fn is None else fn
        args = [evaluate(a, env) for a in self.args]
        kwargs = {k: evaluate(v, env) for k, v in self.kwargs.items()}
        if self.context is not None:
            with evaluate(self.context, env):
                out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        if self.first_of_tuple and isinstance(out, (tuple, list)):
            out = out[0]
        return evaluate(self.output, dict(env, out=out))

    def data(self):
        return data_of([self.context, list(self.args), list(self.kwargs.values())])

    def source(self, name, imports, indent="    "):
        """A Python function `name(fn, q, k, v, <the Data tensors by name>)` making this call;
        its lines."""
        call = f"fn({_args(self.args, self.kwargs, imports)})"
        if len(call) > 80:  # one argument a line
            words = [render(a, imports) for a in self.args]
            words += [f"{k}={render(v, imports)}" for k, v in self.kwargs.items()]
            pad = indent * (3 if self.context is not None else 2)
            call = "fn(\n" + "".join(f"{pad}{w},\n" for w in words) + pad[:-4] + ")"
        params = ", ".join(["fn", "q", "k", "v"] + [d.name for d in self.data()])
        lines = [f"def {name}({params}):"]
        body = []
        if self.context is not None:
            body.append(f"with {render(self.context, imports)}:")
            body.append(f"{indent}out = {call}")
        else:
            body.append(f"out = {call}")
        if self.first_of_tuple:
            body.append("if isinstance(out, (tuple, list)):  # a function that also returns "
                        "its weights")
            body.append(f"{indent}out = out[0]")
        body.append(f"return {render(self.output, imports)}")
        lines += [indent + b for b in body]
        return lines
