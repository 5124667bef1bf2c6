// cudnn_cache._eager: the cached convolution ops called from eager Python at the cost of a torch function.
//
// Note [Eager calls]
// ~~~~~~~~~~~~~~~~~~
// A converted module's forward calls torch.ops.cudnn_cache.convolution.default. From Python that is a boxed
// call: the arguments are matched against the schema and turned into IValues one by one, about 4.5 us above a
// call to F.conv2d, whose binding PyTorch generates around its PythonArgParser (measured on this machine's CPU,
// 2026-12-05: F.conv2d 3.3 us, the op's overload 7.9 us, this module's call 5.1 us, the op's own kernel
// included; on an H100 the overload was +6.7 us above F.conv2d per call in the bench's overhead case). So the
// eager forward of a converted model paid it on every convolution.
//
// These functions parse their arguments with PyTorch's own PythonArgParser, as its generated bindings do, and
// call the op through the dispatcher (a typed call of the same operator: autograd, autocast, vmap, functorch and
// dispatch modes all see the same op). Where an argument, or a mode, has __torch_function__, they call the op's
// Python overload instead, which handles it exactly as a call through torch.ops does, so tensor subclasses and
// torch function modes see the same function as before. Under torch.compile (Dynamo) and TorchScript the
// modules call the overload themselves (modules.py): both trace torch.ops calls, not this module.
//
// The module is built where CMake finds Python's headers and PyTorch's Python library; without it the modules
// call the overload (cudnn_cache._library.eager_calls() is None), with the same results.

#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_arg_parser.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cudnn_cache::torch_ops {
namespace {

namespace py = pybind11;

// torch.ops.cudnn_cache.<name>.default: what a call with __torch_function__ goes to.
PyObject* overload(const char* name) {
  py::object op = py::module_::import("torch").attr("ops").attr("cudnn_cache").attr(name).attr("default");
  return op.release().ptr();
}

// The typed handle of cudnn_cache::<name>, which the ops library registered before this module was imported.
template <typename Signature>
c10::TypedOperatorHandle<Signature> typed_op(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string("cudnn_cache::") + name).c_str(), "")
      .typed<Signature>();
}

using Convolution = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, std::int64_t);
using ConvolutionTranspose = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                        at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                        std::int64_t);

// Calls `op` with the parsed arguments (input, weight, bias, the int lists at 3, 4, ..., then groups), without
// the GIL.
template <typename Signature, std::size_t... List>
at::Tensor call_parsed(const c10::TypedOperatorHandle<Signature>& op, torch::PythonArgs& r,
                       std::index_sequence<List...>) {
  const at::Tensor input = r.tensor(0), weight = r.tensor(1);
  const std::optional<at::Tensor> bias = r.optionalTensor(2);
  const std::array<std::vector<std::int64_t>, sizeof...(List)> lists{r.intlist(3 + List)...};
  const std::int64_t groups = r.toInt64(3 + sizeof...(List));
  py::gil_scoped_release no_gil;
  return op.call(input, weight, bias, at::IntArrayRef(lists[List])..., groups);
}

// The call of op `name`, whose schema (in PythonArgParser's spelling) has `Lists` int lists: parses the
// arguments, then passes them to the op's Python overload where an argument or mode has __torch_function__, else
// calls the op through the dispatcher and wraps its result. One per op, made on its first call.
template <typename Signature, std::size_t Lists>
class EagerCall {
 public:
  EagerCall(const char* name, const char* schema)
      : parser_({schema}), op_(typed_op<Signature>(name)), overload_(overload(name)) {}

  PyObject* operator()(PyObject* args, PyObject* kwargs) {
    torch::ParsedArgs<Lists + 4> parsed;
    torch::PythonArgs r = parser_.parse(args, kwargs, parsed);
    if (r.has_torch_function()) return PyObject_Call(overload_, args, kwargs);
    return THPVariable_Wrap(call_parsed(op_, r, std::make_index_sequence<Lists>()));
  }

 private:
  torch::PythonArgParser parser_;
  c10::TypedOperatorHandle<Signature> op_;
  PyObject* overload_;  // a reference held for the process
};

PyObject* convolution(PyObject*, PyObject* args, PyObject* kwargs) {
  HANDLE_TH_ERRORS
  static EagerCall<Convolution, 3> call("convolution",
                                        "convolution(Tensor input, Tensor weight, Tensor? bias, IntArrayRef stride, "
                                        "IntArrayRef padding, IntArrayRef dilation, int64_t groups)");
  return call(args, kwargs);
  END_HANDLE_TH_ERRORS
}

PyObject* convolution_transpose(PyObject*, PyObject* args, PyObject* kwargs) {
  HANDLE_TH_ERRORS
  static EagerCall<ConvolutionTranspose, 4> call(
      "convolution_transpose",
      "convolution_transpose(Tensor input, Tensor weight, Tensor? bias, IntArrayRef stride, IntArrayRef padding, "
      "IntArrayRef output_padding, IntArrayRef dilation, int64_t groups)");
  return call(args, kwargs);
  END_HANDLE_TH_ERRORS
}

template <PyObject* (*F)(PyObject*, PyObject*, PyObject*)>
PyCFunction as_method() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

PyMethodDef methods[] = {
    {"convolution", as_method<&convolution>(), METH_VARARGS | METH_KEYWORDS,
     "torch.ops.cudnn_cache.convolution.default, called as a torch function is (Note [Eager calls])"},
    {"convolution_transpose", as_method<&convolution_transpose>(), METH_VARARGS | METH_KEYWORDS,
     "torch.ops.cudnn_cache.convolution_transpose.default, called as a torch function is (Note [Eager calls])"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace
}  // namespace cudnn_cache::torch_ops

PYBIND11_MODULE(_eager, module) {
  if (PyModule_AddFunctions(module.ptr(), cudnn_cache::torch_ops::methods) != 0) throw py::error_already_set();
}
