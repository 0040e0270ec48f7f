"""pyfuser's exception types. Each subclasses the builtin a caller would naturally catch.

Definition and input errors are RuntimeErrors too: nvFuser raises every failed check as a RuntimeError, so code
written for it catches that."""


class PyfuserError(Exception):
    """Base of every error pyfuser raises on purpose."""


class FusionDefinitionError(PyfuserError, ValueError, RuntimeError):
    """An op or define_* call got bad arguments (the message names the op and the argument)."""


class FusionDtypeError(FusionDefinitionError, TypeError):
    """An op got an operand of a dtype it does not accept."""


class InputValidationError(PyfuserError, ValueError, RuntimeError):
    """execute() got inputs that contradict the definition (the message names the input position)."""


class InputTypeError(InputValidationError, TypeError):
    """execute() got an input of the wrong Python type or dtype."""


class InputDeviceError(InputValidationError):
    """execute() got inputs on the wrong or on mixed devices."""


class OptionError(PyfuserError, ValueError):
    """An unknown name in _enable_options / _disable_options."""


class FusionExecutionError(PyfuserError, RuntimeError):
    """An op failed while running (e.g. symbolic extents that do not match at run time)."""


class UnsupportedOpError(PyfuserError, NotImplementedError):
    """The op (or this form of it) is not supported; the message names it."""


class UnknownOpError(UnsupportedOpError, AttributeError):
    """``fd.ops.<name>`` for a name pyfuser has no op for; an AttributeError too, so ``hasattr`` answers False."""
