from django.contrib import admin
from django.urls import path
from orders import views

urlpatterns = [
    path("orders/<str:saga>/", views.start_order),
    path("admin/", admin.site.urls),
]
